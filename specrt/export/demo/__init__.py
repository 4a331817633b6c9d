"""How the shipped demo pair was made: corpus, training (``python -m specrt.export.demo.train``) and the
build into the bundle (``python -m specrt.export.demo.build``). The bundle itself lives in ``specrt.demo``."""
