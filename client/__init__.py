"""calor.client."""
