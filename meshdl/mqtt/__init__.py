"""The MQTT transport of a real mesh: one broker session per process (session.py), the
broker's ACL, status records, a private Mosquitto for tests and benchmarks, Mosquitto's
programs, and systemd's notifications for the long-running processes."""
