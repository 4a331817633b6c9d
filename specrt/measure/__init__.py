"""Measurement: ``specrt bench``, ``plan``, the roofline, bandwidth and energy probes, peers run side by side,
and the tables that print them. Reads the runtime; the runtime never imports it."""
