"""The node agent: identity, join, engine selection, front-ends, agent API, heartbeats."""
