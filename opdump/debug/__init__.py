"""The debug dumps (README, "Debug dumps"): sample dump and overflow-only dump.

Each mode is a small module with one job; the recorder and the capture front-ends
call into them, nothing here imports a front-end.
"""
