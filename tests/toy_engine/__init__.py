"""A throwaway engine, written in this one folder and registered by its test alone (`toy.register`):
the proof that a new engine is one folder and one registry line, and that nothing outside
engine_adapter/ assumes which engines exist."""
