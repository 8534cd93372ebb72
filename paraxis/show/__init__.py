"""Pictures, the report and the lab: what paraxis draws and writes for people."""
