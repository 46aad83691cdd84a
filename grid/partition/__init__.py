"""The pure partition core: table, target assignment, migration planner and plan, replica
versions. Stdlib and mmh3 only; no sockets, processes, threads or clocks (DESIGN.md, Layers)."""
