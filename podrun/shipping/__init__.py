"""Getting the workdir to the workers: what ships and its content hash (scan.py, ignore.py,
digests.py), the streamed archive (archive.py) and the relay tree that delivers it (relay.py)."""
