"""The asyncio relay, in rooms by concept; each room imports only the rooms below it.

serve > listen > relay > refusals > produce > lookups > cluster > config > ops (pyproject's
import-linter contracts); `errors` is the layer's one error, raised by any room.
"""
