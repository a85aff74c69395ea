"""What a run leaves for a reviewer: CSV, Markdown, the self-contained report.html and the
manifest, rendered from the RunOutcome verdict/ hands over (the manifest built by run/)."""
