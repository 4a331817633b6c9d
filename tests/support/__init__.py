"""Shared test support: tiny models built from configs, device and TensorRT stand-ins."""
