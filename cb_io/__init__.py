"""cb_io: the project's files, for every layer: durable JSONL appends and reads, atomic
replacement of files and folders, one writer per output, no write through a link, and where the
caches live (:mod:`cb_io.storage`, :mod:`cb_io.paths`).

The numerical core (``cb_core``) writes no files; the games (``envs``), the LM backends and the agent
shell all write theirs through here, so none of them imports another layer to write a file.
Imports nothing else of this project.
"""
