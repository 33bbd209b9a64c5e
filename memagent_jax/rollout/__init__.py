"""Decoding: the engine, sampling, the request scheduler, the MemAgent workflow and the factory
(`agent.build_agent`) every front end assembles them with."""
