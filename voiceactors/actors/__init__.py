"""The actors: BrainActor, ToolExecutor, CallSupervisor/CallActor."""
