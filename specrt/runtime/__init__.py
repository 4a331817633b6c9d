"""The numpy side of specrt: sampling, verification, KV cache, the loop and the backends. Never imports torch."""
