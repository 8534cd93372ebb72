"""torch.distributed plumbing every axis uses: process groups from the Layout, the watchdog,
parameter roles, the shared exchanges, memory counters, heartbeats, preemption and launching
ranks."""
