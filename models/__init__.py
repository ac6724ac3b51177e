"""calor.models."""
