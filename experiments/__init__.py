"""The reproduction study: does B_simple predict the critical batch size?

Run with ``python -m experiments``; see docs/reproduction.md.
"""
