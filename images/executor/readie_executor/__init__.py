"""readie executor: runs pickled functions inside a gVisor sandbox (see protocol.py)."""
