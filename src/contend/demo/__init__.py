"""The demo workload: parse and aggregate generated web-server logs."""
