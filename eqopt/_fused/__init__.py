"""The fused engine: packed parameters and bucketed optimiser state."""
