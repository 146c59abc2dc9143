"""Chapter 12: the capstone — train a GPT end to end on the layout you choose."""
