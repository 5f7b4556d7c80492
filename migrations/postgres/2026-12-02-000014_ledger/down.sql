DROP TABLE backlog_samples;
DROP TABLE usage_tallies;
DROP TABLE budget_reservations;
DROP TABLE budgets;
DROP TABLE usage_ledger;
