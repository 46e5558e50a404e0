"""The walkers: an engine of one fixed shape run over inputs of any length (windows, stateful
steps), the contract-driven sidecars that do it, and the window planner."""
