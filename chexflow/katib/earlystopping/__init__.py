"""Early stopping: medianstop (Katib's pkg/earlystopping/v1beta1/medianstop)."""
