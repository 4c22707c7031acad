"""Engines as the catalogue knows them: the contract every engine implements
(`base.py`) and the registry of what each engine is (`registry.py`), both without
importing any engine. The engines themselves live in `inference/engines/`, named
here by dotted path and imported only by `load_engine` in an inference worker."""
