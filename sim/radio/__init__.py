"""The simulated radio's physics: the clock, the media and their compiled contention,
radio and device profiles, the link layer and frame loss, energy, and the backhaul."""
