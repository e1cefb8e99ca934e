"""Building images/*/Dockerfile with podman on a local Debian base, cached by content."""
