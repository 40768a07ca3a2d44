"""Pure torch introspection: layers, hooks, captures, statistics, summaries, state dicts, checkpoints."""
