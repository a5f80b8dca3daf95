-- The demo audience: every customer, with the columns the message uses.
SELECT user_id, phone, first_name, city
FROM customers
ORDER BY user_id
