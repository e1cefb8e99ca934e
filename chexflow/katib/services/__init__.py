"""Katib's Suggestion and EarlyStopping gRPC services, served with chexflow's suggesters."""
