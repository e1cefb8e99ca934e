"""Suggestions: the algorithms table, settings rules, a module per library (pkg/suggestion)."""
