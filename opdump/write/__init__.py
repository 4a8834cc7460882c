"""Writing: the on-disk layout, file formats, and the background writer."""
