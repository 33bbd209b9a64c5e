"""Decoding: the engine, sampling, the request scheduler, the MemAgent workflow and the factory
(`factory.build_agent`) every front end assembles them with."""
