"""Node-to-node links: persistent aiohttp websockets carrying authenticated frames."""
