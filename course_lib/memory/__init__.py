"""Chapter 01: where training memory goes — measured with torch's tracker, predicted by formula."""
