"""HTTP: OpenAI-compatible completions and chat with streaming, and swarm status. Declares the
interface it needs from the node (`Backend`) and never imports runtime, net or wire."""
