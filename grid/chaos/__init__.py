"""Chaos testing: a workload under seeded faults, its recorded history and its verdict."""
