"""Output quality: the teacher-forced probe against a reference (probe) and its gate (gate)."""
