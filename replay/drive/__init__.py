"""Driving a real engine: the open-loop request driver, the sampler, and the replay run."""
