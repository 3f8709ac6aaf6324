"""Image/video preprocessing to patches, tokenizers and chat templates, visual-token counts."""
