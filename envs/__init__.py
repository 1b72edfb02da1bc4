"""envs: one adapter per benchmark (ALFWorld, ScienceWorld, TextWorld) behind one protocol.

Imports nothing else of this project.
"""
