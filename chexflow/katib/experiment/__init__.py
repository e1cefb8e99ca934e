"""The Katib Experiment model, its spec reader (defaults, webhook rules) and trial templates."""
