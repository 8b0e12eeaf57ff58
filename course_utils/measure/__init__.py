"""Measuring on the learner's machine, truthfully.

- `setup_check`  the welcome notebook's check: cores, and threads really running at once
"""
