"""Recovery: the logs a gateway replays from when a client resumes, and the inbox."""
