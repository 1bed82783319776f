"""Loaded by the real LiteLLM proxy (not by pytest): a pre-call hook that answers an end
user whose id starts with `over-budget` with LiteLLM's own BudgetExceededError, worded as its
end-user budget check words it. That check needs LiteLLM's database, which cannot run
offline; the error then travels LiteLLM's real error path (status
`budget_exceeded_status_code`, 422 by default)."""

import litellm
from litellm.integrations.custom_logger import CustomLogger


class OverBudget(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        user = data.get("user") or ""
        if user.startswith("over-budget"):
            raise litellm.BudgetExceededError(
                current_cost=0.2,
                max_budget=0.1,
                message=f"ExceededBudget: End User={user} over budget. Spend=0.2, Budget=0.1",
            )
        return data


over_budget = OverBudget()
