"""Fitted numbers the analyses read: thresholds and the confidence calibration.

The files beside this module are data, written by ``scripts/tune.py`` from the
development splits of the project's corpora; the analyses in :mod:`holmes.localize`
read their thresholds from here instead of carrying numeric literals.
"""
