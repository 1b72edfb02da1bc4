"""cb_io: the project's records and their files, for every layer: the records beneath both the
games and the agents (:mod:`cb_io.records`: task start, step result, step, trajectory, the think
vocabulary, a game's faults), durable JSONL appends and reads, atomic replacement of files and
folders, one writer per output, no write through a link, and where the caches live
(:mod:`cb_io.storage`, :mod:`cb_io.paths`).

The numerical core (``cb_core``) writes no files; the games (``envs``), the LM backends and the agent
shell all write theirs through here, so none of them imports another layer to write a file, and the
agents read the games' records from here without importing the games. Imports nothing else of this
project.
"""
