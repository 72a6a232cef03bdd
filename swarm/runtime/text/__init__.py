"""Text around the model: chat templates (`chat`) and the token masks of structured output
(`grammar`)."""
