"""Faults the simulator injects: dead cells, stragglers, message chaos (duplicates,
delays, corruption, forgeries) and a hostile MQTT client."""
