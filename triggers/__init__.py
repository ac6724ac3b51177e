"""calor.triggers."""
