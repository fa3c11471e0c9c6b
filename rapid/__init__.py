"""RAPID: importance-weighted group policy gradient for fast off-policy RL fine-tuning (arXiv 2510.03515)."""
