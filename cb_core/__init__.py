"""cb_core: the concept model of CB-Agent as pure JAX functions (no I/O in the maths, no LM, no env).

Imports nothing else of this project.
"""
