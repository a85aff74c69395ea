"""What a run leaves for a reviewer: CSV, Markdown, the self-contained report.html and the
manifest."""
