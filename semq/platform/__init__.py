"""platform."""
