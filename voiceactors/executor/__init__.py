"""The tool executor: the actor that runs every tool call (``actor``) and the durable record of its writes (``write_log``); docs/tools.md."""
