"""Jepsen-style fault testing: seeded fault schedules (schedule.py), a workload that records its
history (workload.py) and a checker that judges it (checker.py)."""
