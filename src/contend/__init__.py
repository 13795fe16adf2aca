"""contend."""
