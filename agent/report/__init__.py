"""What a pass says: diff reports (live and offline), summaries, Events."""
